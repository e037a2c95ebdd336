"""mmq: a multimodal inference job service."""

__version__ = "0.1.0"
