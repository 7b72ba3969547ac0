"""The deploy pipeline's entry (``deploy.py``): one ``deploy``/``profile`` for every kind of model. It resolves the
target once and hands the run to its workload's orchestration: a fixed graph's recipe run or search
(``orchestration/``, ``variant_search/``), a generator's race (``orchestration/generate.py``), a microcontroller's
TFLite Micro run (``orchestration/micro.py``) or a fleet (``orchestration/fleet.py``). It sits above the search,
which sits above the stages it shares with deploy (preparation, options, steps, report assembly, ship writer,
release gate), so no two packages import each other."""
