"""Threat models, attacks and attack suites."""
