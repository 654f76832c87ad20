"""Which `trl-es vllm-serve` servers a run uses, and which of them each training process drives."""

from __future__ import annotations


def server_urls(base_url: str | None, host: str, port: int) -> list[str]:
    """The servers of `vllm_mode="server"`: `vllm_server_base_url` (one URL, or several separated by commas), else
    `http://host:port`."""
    if not base_url:
        return [f"http://{host}:{port}"]
    return [url.strip().rstrip("/") for url in base_url.split(",") if url.strip()]


def check_server_urls(urls: list[str], processes: int) -> None:
    """Refuse a list of servers that the training processes cannot share out: every server belongs to one process,
    and every process drives as many."""
    repeated = sorted({url for url in urls if urls.count(url) > 1})
    if repeated:
        raise ValueError(
            f"vllm_server_base_url lists {repeated[0]!r} more than once: a server holds one run's master and loads "
            "one member at a time, so each listed server must be a different `trl-es vllm-serve` (another port or "
            "host)."
        )
    for url in urls:
        scheme, _, address = url.partition("://")
        if scheme not in ("http", "https") or not address:
            raise ValueError(
                f"vllm_server_base_url has {url!r}, which is not a server address: give each server as "
                "http://host:port, several separated by commas (e.g. 'http://10.0.0.1:8000,http://10.0.0.2:8000')."
            )
    if len(urls) % processes:
        raise ValueError(
            f"{len(urls)} vLLM server(s) for {processes} training processes: each process drives servers of its own, "
            f"so list a multiple of {processes} in vllm_server_base_url (comma-separated; start one `trl-es "
            "vllm-serve` per address), e.g. one per process."
        )


def servers_of_process(urls: list[str], process_index: int, processes: int) -> list[str]:
    """The servers process `process_index` drives: its contiguous share of `urls`."""
    per_process = len(urls) // processes
    return urls[process_index * per_process : (process_index + 1) * per_process]
