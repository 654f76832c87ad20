"""Built-in tasks with verifiers: offline arithmetic word problems and GSM8K (or its offline `gsm_symbolic` twin)."""
