"""The tools layer: benchmarks, training and the transformers baselines behind the minispec command.

  bench.py        measured sweeps over batch, gamma and temperature beside the roofline; vLLM's table measured
  steps.py        step times measured on this device
  pair.py         a target and a draft named on the command line, loaded
  demo.py         what `minispec demo` and `minispec generate` run
  train.py        the embedded byte-level models, trained on a CPU
  train_eagle.py  EAGLE heads for any target, trained on a CPU
  baselines.py    transformers' generate (plain, assisted, prompt lookup) on the same prompts
"""
