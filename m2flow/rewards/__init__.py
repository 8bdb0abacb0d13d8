"""Reward functions: math answer verification under a time limit, and a registry of rewards.

Kept free of torch and Ray so that sandbox worker processes import only what they need; import
from the submodules (``m2flow.rewards.sandbox``, ``m2flow.rewards.registry``...).
"""
