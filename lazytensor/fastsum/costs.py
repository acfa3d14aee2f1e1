"""The cost model's constants: seconds per unit of work on a 2-core x86 machine.

Fitted to ``python -m benchmarks.bench_fast_sums --calibrate`` (the exact kernel's pairs
per second, the block-sparse kernel's, the grid clustering, finufft's per-point and
spreading costs, its FFTs), on a machine shared with other jobs: absolute values are
about 4× a quiet machine's, their ratios are what the choice reads. They are estimates,
never part of a bound.
"""

PAIR_S = {"float32": 2.7e-9, "float64": 7.7e-9}  # one pair of the exact kernel, E = 1
RANGED_PAIR_S = 9.2e-9  # one pair of the block-sparse kernel (float64), E = 1
BLOCK_S = 1e-6  # one (block, interval) work item of the block-sparse kernel
SORT_S = 1.2e-6  # one point of the grid clustering (cells, sort, gather)
NUFFT_POINT_S = 1.2e-6  # one point of a NUFFT, whatever its precision (sorting, setup)
SPREAD_S = 1.0e-9  # one point times one grid point of finufft's spreading
FFT_S = 1.0e-8  # one grid point times log2(points) of an FFT
SAMPLE_S = 1e-7  # one sample of a sampled kernel (profile, mask, window, DCT)
CALL_S = 5e-3  # fixed cost of a method beyond the exact sum (planning, launches)
