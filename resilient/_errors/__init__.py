"""
The library's exceptions, one module per family: the base that makes every
exception portable (`_base`), configuration errors, the timeouts, the
rejections of breakers and bulkheads, retry's give-up on a result, and the
locks' errors.

Users import them from `resilient` or `resilient.exceptions`, which
re-exports every public name here and keeps ``__module__`` (what pickles,
reprs and the docs name) at ``resilient.exceptions``.
"""
