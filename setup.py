"""Kept for tools that call setup.py; the metadata lives in setup.cfg."""

from setuptools import setup

setup()
