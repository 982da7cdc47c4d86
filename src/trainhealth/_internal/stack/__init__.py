"""A local monitoring stack without docker: ``trainhealth stack up`` / ``down``."""
