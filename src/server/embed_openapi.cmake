# Writes docs/openapi.json into a C++ source as kestrel::server::openapi_json().
file(READ ${IN} SPEC)
file(WRITE ${OUT}
  "// Generated from docs/openapi.json by embed_openapi.cmake; do not edit.\n"
  "#include \"server/routes.h\"\n"
  "namespace kestrel::server {\n"
  "const std::string& openapi_json() {\n"
  "  static const std::string spec = R\"KESTREL_OPENAPI(${SPEC})KESTREL_OPENAPI\";\n"
  "  return spec;\n"
  "}\n"
  "}  // namespace kestrel::server\n")
