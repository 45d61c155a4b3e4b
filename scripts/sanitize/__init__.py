"""The compute-sanitizer cases of every raw NVRTC kernel, and what runs them (``scripts/sanitize_kernels.py``).

``registry``: the case table (``Case``, ``KernelRef``, families, the sanitizer filters); ``inputs``: the small
tensors the cases build; one module per kernel family of cases (``weight_only_cases``, ``converter_cases``,
``conv_cases``, ``scheme2_cases``, ``quantizer_cases``, ``w8a8_cases``) and ``cases``, which builds them all;
``coverage``: the kernel names in the sources (no GPU); ``build``: the NVRTC modules of cases and their
ahead-of-time compilation; ``launch_trace``: which kernels a case really launched; ``running``: selection, the
sanitizer command line and the run itself.
"""
