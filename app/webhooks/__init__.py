"""Webhooks: batch events sent to the owner's endpoint, signed per Standard Webhooks."""
