// Typeset TeX with KaTeX, offline: reads [{"tex": ..., "display": bool}, ...] as JSON on stdin,
// writes the HTML of each formula, in order, as a JSON list on stdout (courseware/formulas.py calls it).
// An invalid formula fails the build with KaTeX's message rather than print as red text.
const katex = require("katex");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const out = JSON.parse(input).map(({ tex, display }) =>
    katex.renderToString(tex, { displayMode: display, throwOnError: true, output: "htmlAndMathml", strict: "ignore" }));
  process.stdout.write(JSON.stringify(out));
});
