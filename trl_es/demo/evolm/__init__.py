"""The offline EVOLM demo: a tiny joint policy/rubric model, a tiny pattern-matching judge, and their scripts."""
