-- The job role inserts into staging and reads none of it. Spark's JDBC writer read a
-- table's columns with a SELECT before it appended (0011 granted SELECT for it); the COPY
-- writer that replaced it (jvm/) needs INSERT only. Registration grants new staging tables
-- INSERT alone (sql/ledger.sql).
DO $$
DECLARE
    staging regclass;
BEGIN
    FOR staging IN SELECT c.oid FROM pg_class c WHERE c.relkind = 'r' AND exactly_once.is_staging(c.oid) LOOP
        EXECUTE format('REVOKE SELECT ON %s FROM exactly_once_job', staging);
    END LOOP;
END $$;
