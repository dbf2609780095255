"""Encoders by name (timm, efficientnet_lite0) and projection heads."""
