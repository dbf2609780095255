"""Tests of the γ/α search and its known-class validation split."""
