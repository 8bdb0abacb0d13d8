"""m2flow: flexible and efficient RL training through macro-to-micro flow transformation."""

__version__ = "0.1.0"
