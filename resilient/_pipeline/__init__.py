"""
The pipeline: what runs one call through a policy.

Composition order, outermost first: total budget -> retry (with the retry
budget) -> the admission stages of `_stage.ORDER` (circuit breaker, then
bulkhead) -> attempt timeout -> the call. Each stage exists only if the
policy configures it, so a plain retry policy pays nothing for them.

- `_stage`: the `Stage` protocol and the `ORDER` table;
- `_guards`: a policy's stages and retry budget, built once per decorated
  function;
- `_call`: one call's state (deadline tokens, telemetry, lazy machine);
- `_cut`: the error of an async attempt cut at its deadline, and whether
  the request it cut may run again;
- `_discard`: closing a response the policy discards to retry;
- `_inloop`: sync forms refused on an event loop's thread at their first
  call;
- `_flow`: the one generator every decision is written in;
- `_run`: the sync and async decorator drivers, with the bare first attempt;
- `_block`: the block form, a third driver of the same flow.
- `_stream`: generator functions under a policy (the flow up to the first
  item) or a standalone breaker or bulkhead, guarded for the stream's life.

Layers import only downward: `resilient._policy` (the face) imports this
package, which imports the machines (`resilient._retry`, the breaker, the
bulkhead, the retry budget) and `resilient._core`; nothing here imports
the face.
"""
