"""The controller's web page (index.html, app.js, app.css): static files served by ``api``."""
