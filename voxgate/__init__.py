"""voxgate: a real-time voice stack built around streaming TTS engines."""

__version__ = "0.1.0"
