"""The cost model's constants: seconds per unit of work on a 2-core x86 machine.

Measured by ``python -m benchmarks.bench_fast_sums --calibrate`` (the exact kernel's
pairs per second, finufft's spreading and FFT), rounded; the choice among methods only
needs their ratios to be right within a factor of about two. They are estimates, never
part of a bound.
"""

PAIR_S = {"float32": 1.0e-9, "float64": 2.0e-9}  # one pair of the exact kernel, E = 1
RANGED_PAIR_S = 2.5e-9  # one pair of the block-sparse kernel (float64), E = 1
BLOCK_S = 2e-7  # one (block, interval) work item of the block-sparse kernel
SORT_S = 1.5e-7  # one point of the grid clustering (cells, sort, gather)
SPREAD_S = 1.5e-9  # one point times one grid point of finufft's spreading
FFT_S = 2.0e-9  # one point times log2(points) of an FFT
SAMPLE_S = 3e-8  # one sample of a sampled kernel (profile, mask, window, DCT)
CALL_S = 2e-3  # fixed cost of a method beyond the exact sum (planning, launches)
