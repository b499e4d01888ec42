"""The project's own CUDA kernels: their source, its PTX, the weight layouts they read, and their launch."""
