"""The demo workflow."""
