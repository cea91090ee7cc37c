"""Speech runtime: what every transport needs to turn text into a listener's audio (issue 17).

Layer: above the engines, below the product (`serving`, `agent`), which speak through it. So
far it holds the starter cache and cached openers (`starter`); admission, segmentation policy,
pacing and scheduling move here next.
"""
