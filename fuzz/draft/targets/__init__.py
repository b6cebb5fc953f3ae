"""The draft broadcast's built-in targets: the versions, the mutants and vLLM's handler."""
