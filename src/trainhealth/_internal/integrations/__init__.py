"""The trainer integrations' code; users import them from :mod:`trainhealth.integrations`."""
