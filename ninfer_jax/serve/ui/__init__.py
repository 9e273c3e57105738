"""The built-in web page: chat with the served model and live metrics plots (serve/ui/routes.py)."""
