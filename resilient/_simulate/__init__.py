"""
The retry simulator: many clients, one dependency that goes down.

Its parts, each a module:

- `_config`: what to simulate (`SimulationConfig`, `make_policy`...);
- `_options`: the command line's options, in one table; `_parser`, the
  argparse parser made from it; `_cli`, the arguments read into a
  simulation and written back;
- `_engine`: the discrete-event run in virtual time (`simulate`), with
  `_calendar`, its queue of events (and the chart's buckets), and
  `_fleet`, what the clients share (the clock, the breaker and retry
  budget, the dependency's errors, when the calls start);
- `_result`: what it measured (`SimulationResult`, `Summary`);
- `_diagnose`: what the figures say to change in the policy;
- `_render`, `_plot`: the text and the drawings.

The public names are re-exported by `resilient.simulation`.
"""
