"""Agentic RL: a language model acting over several turns in text environments and with tools."""
