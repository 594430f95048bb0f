// Parse LogQL queries (a JSON array on stdin) with @grafana/lezer-logql; print, per query,
// the offsets of the parser's error nodes (empty: the query parses). Used by tests/logs.
const { parser } = require("@grafana/lezer-logql");

const queries = JSON.parse(require("fs").readFileSync(0, "utf8"));
const results = queries.map((query) => {
  const errors = [];
  parser.parse(query).iterate({
    enter: (node) => {
      if (node.type.isError) errors.push(node.from);
    },
  });
  return { query, errors };
});
process.stdout.write(JSON.stringify(results));
