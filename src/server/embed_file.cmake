# Writes the file IN into a C++ source OUT as `const std::string& kestrel::server::FUNC()`.
file(READ ${IN} TEXT)
file(WRITE ${OUT}
  "// Generated from ${NAME} by embed_file.cmake; do not edit.\n"
  "#include \"server/routes.h\"\n"
  "namespace kestrel::server {\n"
  "const std::string& ${FUNC}() {\n"
  "  static const std::string text = R\"KESTREL_EMBED(${TEXT})KESTREL_EMBED\";\n"
  "  return text;\n"
  "}\n"
  "}  // namespace kestrel::server\n")
