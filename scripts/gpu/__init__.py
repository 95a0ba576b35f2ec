"""The GPU suite's parts (``scripts/gpu_suite.py`` is the command): ``plan`` (the steps, their sizes and shares),
``wheels`` (the offline set-up), ``probe`` (the environment, read from the last line of a child's stdout),
``runner`` (the budget, each step in its own process group, the summary rewritten as it goes) and
``pytest_stream`` (a pytest plugin: one flushed JSON line per test report). Standard library only: the suite's
own process never imports torch or DGL, so nothing it does can hold the GPU or print DGL's notices."""
