"""gpu: an independent implementation of the arena contract on torch devices (Triton kernels; see README.md)."""
