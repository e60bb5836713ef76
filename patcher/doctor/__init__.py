"""`sglpatch doctor`: read an SGLang tree's own source (never import it) and answer whether it runs
on capability-12 GPUs, with EAGLE-3 on a given model.

- `scanner` (over `candidates`, `chunks`, `gates`, `tables`; `gates` over `decisions`,
  `evaluator` and `devices`): capability gates and what capability 12 gets at each (suspects);
- `eagle3`: the methods EAGLE-3 calls on the target model;
- `census`: the generation models SGLang registers, and their methods;
- `coverage`: the catalogue run in memory, which patches still have work and what they cover;
- `verdict`: blockers, suspects, and the one-line answer (`verdict.diagnose`, a `diagnosis`).

The package imports none of them itself; `pool` runs the scan and `coverage` in worker processes.
"""
