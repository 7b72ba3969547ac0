"""The runs: deploy's closed loop (pipeline), a fleet run, the steps they share, what a run is asked
to do (options, prepare), its clock, the pass cache, and what it ships."""
