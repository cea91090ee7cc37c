"""Regression harness: signal checks, gates with one threshold file, golden baselines, reports.

`signals` holds the pure audio measures (numpy only) that every regression (`regress tts`,
`regress e2e`) builds on; `gates` turns measured numbers into PASS/FAIL verdicts.
"""
