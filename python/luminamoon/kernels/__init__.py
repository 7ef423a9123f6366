"""luminamoon.kernels: the device code of the TDCLM step and its ABI catalog.

``layout`` (the device tables' columns, dtype and mode codes; no Triton), ``quant`` (the q8
codebooks and block layout in plain torch; no Triton), ``tdclm`` (every
@triton.jit function), ``catalog`` (kernel specs, variants and launch shapes: what the JIT
backend launches and the AOT builder compiles), ``launch`` (the host launchers). Nothing here
imports from ``luminamoon.optimizer``; importing this package imports nothing else.
"""
