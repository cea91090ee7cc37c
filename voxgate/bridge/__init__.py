"""LLM-to-speech bridge: turns a streaming LLM reply into segments a TTS engine can speak."""
