"""Qwen3-TTS 12 Hz in voxgate's own PyTorch code: talker, code predictor, codec decoder.

The official implementation is only a test-time reference; nothing here imports it.
"""
