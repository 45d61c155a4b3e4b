"""Thin wrappers that launch the raw NVRTC kernels of ``custom_kernels`` (GPU only)."""
