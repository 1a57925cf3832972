-- Statements of the rights check of each pipeline database connection (plugins/exactly_once/operate/privileges.py).

-- name: powers
-- What makes a role more than its grants: each attribute or membership the role holds.
SELECT power FROM (VALUES
    ('is a superuser', (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)),
    ('may create roles (CREATEROLE: it could grant itself any role)',
     (SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user)),
    ('bypasses row-level security (BYPASSRLS)', (SELECT rolbypassrls FROM pg_roles WHERE rolname = current_user)),
    ('is a member of pg_execute_server_program', pg_has_role('pg_execute_server_program', 'MEMBER')),
    ('is a member of pg_write_server_files', pg_has_role('pg_write_server_files', 'MEMBER')),
    ('is a member of pg_read_server_files', pg_has_role('pg_read_server_files', 'MEMBER'))
) AS held (power, holds)
WHERE holds;

-- name: table_rights
-- Each (schema, table, privilege) asked whose table exists, and whether the connection's role
-- holds it on the table, and on the table or any of its columns (a column grant is a right
-- too). Found through the catalog, which any role reads: to_regclass would need the
-- schema's USAGE.
SELECT asked.schema_name, asked.table_name, asked.privilege, has_table_privilege(c.oid, asked.privilege),
       CASE WHEN asked.privilege IN ('SELECT', 'INSERT', 'UPDATE') THEN has_any_column_privilege(c.oid, asked.privilege)
            ELSE has_table_privilege(c.oid, asked.privilege) END
FROM unnest(%(schemas)s::text[], %(tables)s::text[], %(privileges)s::text[])
     AS asked (schema_name, table_name, privilege)
JOIN pg_namespace n ON n.nspname = asked.schema_name
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = asked.table_name;

-- name: function_rights
SELECT name, has_function_privilege(name, 'EXECUTE')
FROM unnest(%(names)s::text[]) AS asked (name)
WHERE to_regprocedure(name) IS NOT NULL;

-- name: schema_rights
-- Whether the role may use each schema, or will once registration grants it: registration
-- grants the job role USAGE on the schemas the commit role owns (sql/ledger.sql).
SELECT asked.schema_name,
       has_schema_privilege(n.oid, 'USAGE') OR pg_has_role(coalesce(%(commit_role)s, current_user), n.nspowner, 'USAGE')
FROM unnest(%(schemas)s::text[]) AS asked (schema_name)
JOIN pg_namespace n ON n.nspname = asked.schema_name;

-- name: current_user
SELECT current_user::text;

-- name: search_path
-- The schemas the commit role's session resolves unqualified names in (those that exist).
SELECT pg_catalog.current_schemas(false)::text[];

-- name: create_rights
-- Where the connection's role may create objects: in each schema asked that exists, and in
-- the database itself (schema_name NULL: it may create a schema, say one named after the
-- commit role, first in its search path). Each row is one way it holds the right: granted to
-- PUBLIC or to a role it is a member of (is_owner false), or owning it through such a role
-- (is_owner true). `through` is the role's name as SQL takes it.
SELECT n.nspname::text, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, false
FROM unnest(%(schemas)s::text[]) AS asked (schema_name)
JOIN pg_namespace n ON n.nspname = asked.schema_name
CROSS JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) AS a
WHERE a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner AND (a.grantee = 0 OR pg_has_role(a.grantee, 'MEMBER'))
UNION ALL
SELECT n.nspname::text, n.nspowner::regrole::text, true
FROM unnest(%(schemas)s::text[]) AS asked (schema_name)
JOIN pg_namespace n ON n.nspname = asked.schema_name
WHERE pg_has_role(n.nspowner, 'MEMBER')
UNION ALL
SELECT NULL, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, false
FROM pg_database d
CROSS JOIN LATERAL aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) AS a
WHERE d.datname = current_database() AND a.privilege_type = 'CREATE' AND a.grantee <> d.datdba
  AND (a.grantee = 0 OR pg_has_role(a.grantee, 'MEMBER'))
UNION ALL
SELECT NULL, d.datdba::regrole::text, true
FROM pg_database d
WHERE d.datname = current_database() AND pg_has_role(d.datdba, 'MEMBER');

-- name: role_and_database
SELECT current_user::text, current_database()::text;
