-- PLACEHOLDER on branch schedmove only: migrations are numbered without gaps
-- (migrate.py), and 0012 is the max_running -> max_running_jobs rename of
-- another branch (quotaname). This file has the same name so that a merge of
-- both branches stops on an add/add conflict here: resolve it with the
-- rename's version, never this one.
SELECT 1;
