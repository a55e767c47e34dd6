"""Measuring machinery: the suite runner (``run``), adapters (one per buffer implementation), what a
measurement ran under (``conditions``), bootstrap intervals (``stats``), the CI regression check
(``regression``, ``instructions``, ``step_costs``), and the tables, figures and HTML page drawn from stored
results (``tables``, ``figures``, ``html_report``, ``plotting``)."""
