"""The package version (read by hatch at build time, and by the vLLM worker extension without importing the
package face)."""

__version__ = "0.1.0"
