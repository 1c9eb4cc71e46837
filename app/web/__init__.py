"""The dashboard: pages, partials and live updates."""
