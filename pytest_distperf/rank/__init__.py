"""Everything that runs inside a rank process.

The rule: modules here import torch (inside their functions), :mod:`pytest_distperf.records`,
:mod:`pytest_distperf.common` and each other, and nothing else of pytest-distperf.  The
controller sends them work through the pool (:mod:`pytest_distperf.pool`) and gets back records
(:mod:`pytest_distperf.records`): plain frozen dataclasses, never torch objects.

* :mod:`~pytest_distperf.rank.worker`: the loop of a spawned rank (receive, run, reply);
* :mod:`~pytest_distperf.rank.gpu`: a GPU rank's driver, CUDA runtime and NVLinks, for the
  environment key;
* :mod:`~pytest_distperf.rank.phase`: ``set_phase``, what the rank is doing now;
* :mod:`~pytest_distperf.rank.clock`: the rank's device (``use_device``, ``rank_device``), the
  one clock (CUDA events or ``perf_counter``) and the barrier-aligned timing loop with its
  host-speed control;
* :mod:`~pytest_distperf.rank.memory`: the peak memory a step reports, what held it on a
  GPU, and what an out-of-memory error says;
* :mod:`~pytest_distperf.rank.collectives`: the rank half of ``bench`` and ``bench_pairs``;
* :mod:`~pytest_distperf.rank.ddp`: build, wrap and time training steps;
* :mod:`~pytest_distperf.rank.inputs`: what a step is fed: its batch, the loss's target, the
  default loss;
* :mod:`~pytest_distperf.rank.shares`: ``batch_shares``: this rank's rows, its loss's weight,
  the calibration of ``"auto"``;
* :mod:`~pytest_distperf.rank.fsdp`: which blocks FSDP2 shards (tied weights, blocks
  sharded already) and the sharding;
* :mod:`~pytest_distperf.rank.mesh`: a ``DeviceMesh`` of named dimensions, the model's
  parallelisation over it, and a step's collectives counted by dimension;
* :mod:`~pytest_distperf.rank.pipeline`: pipeline stages, a schedule by name, each stage's
  busy time per step;
* :mod:`~pytest_distperf.rank.profile`: one call under ``torch.profiler``.
"""
