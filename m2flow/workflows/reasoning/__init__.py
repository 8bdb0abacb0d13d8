"""The reasoning workflow."""
