"""The engine: the per-batch stages and the owners of a table's in-flight state (ARCHITECTURE.md draws the
schedule). It imports nothing from the layers above it (``embedding``, ``loader``, ``optim``, ``baselines``,
``app``); they plug in through :mod:`.kernel` (row kernels, committers) and :mod:`.hooks` (baselines).

Modules, in data-flow order:

* :mod:`.stage` -- the background-thread contract (bounded queues, stop event, timeouts);
* :mod:`.depth` -- ``prefetch="auto"``;
* :mod:`.epoch_resources` -- what an epoch owns (gather thread, reads not handed out, leases);
* :mod:`.store` -- the CPU table, value ‖ optimizer state;
* :mod:`.reads` -- a read opens at the current version and closes once;
* :mod:`.gather` -- a batch's rows read, their copy started (gather thread);
* :mod:`.transfer` -- host <-> device copies and the stream-handoff helper;
* :mod:`.structure` -- the sampled graphs on the copy stream;
* :mod:`.batch` -- one batch's rows of one table: ``TableRows`` (gathered), ``HandedOut``, ``BatchState``;
* :mod:`.oac` -- the version clock and the device write log (validate, patch);
* :mod:`.handout` -- validate, patch, make and attach leaves (caller's thread);
* :mod:`.hooks` -- the interface of async's baselines;
* :mod:`.pending` -- batches handed out and not committed, their leaves;
* :mod:`.combine` -- one gradient per row over a step's reads;
* :mod:`.kernel` -- the row-kernel and committer interfaces;
* :mod:`.step_plan`, :mod:`.commit` -- the one step plan (inside ``step()``), and its local exchange;
* :mod:`.refresh` -- held batches brought up to the newest step;
* :mod:`.write_path` -- the step counter and the one write path;
* :mod:`.writeback` -- committed steps applied in step order (write-back thread);
* :mod:`.leases` -- the write-back thread and the write log, leased by epochs;
* :mod:`.pipeline` -- ``TablePipeline``, one table's owners composed;
* :mod:`.stats`, :mod:`.syncaudit`, :mod:`.table_view` -- ``loader.stats``, the host-sync audit, ``emb.weight``.
"""
