"""CUDA on CPU: simulated streams, events and collectives, and their threads glue."""
