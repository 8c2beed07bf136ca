"""What Kiln's server, its device agent and its client agree on, as a package of its own (distribution kiln-contract).

Precisions, output kinds, metrics and tolerances (`contract`, `metrics`), variant labels (`labels`), how datasets are
fed (`feeds`, `npzio`, `batching`) and prepared from raw data (`recipes`), paired timing and the one rule for "beyond
noise" (`paired`), the shape of a runtime's operator-support answer (`operator_support`), and the retrying HTTP base and
resumable uploads every client of the server uses (`http`, `resumable`). Pure Python on numpy and requests: no Django,
no runtime, and nothing of `kiln`, `workers`, `devices` or `kiln_client` (tests/test_imports.py).
"""
