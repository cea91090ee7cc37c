"""Speech runtime: what every transport needs to turn text into a listener's audio (issue 17).

Layer: above the engines, below the product (`serving`, `agent`), which speak through it. It
holds the starter cache and cached openers (`starter`), admission and limits (`limits`), the
listener's playback clock that deadlines and pacing read (`clock`), and the engine pool and
stream every transport drives an engine with (`workers`, `stream`). See docs/speech-runtime.md.
"""
