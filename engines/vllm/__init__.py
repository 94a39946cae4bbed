"""vLLM 0.33.0's real v1 KV cache manager: loading it without its dependency set (``load``), driving it
(``driver``) and the block-pool checks on its state (``checks``)."""
