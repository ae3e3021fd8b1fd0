// Generation jobs per dialect: TGI /generate (JSON) and /generate_stream (SSE),
// OpenAI completions and chat (JSON or SSE ending in [DONE]).
#pragma once

#include <memory>

#include "server/generate_request.h"
#include "server/openai.h"
#include "server/routes.h"

namespace kestrel::server {

// from_root: POST / answers a one-element array (what the clients parse).
std::unique_ptr<GenerationJob> make_tgi_job(GenerateParams params, bool from_root,
                                            const text::Tokenizer* tokenizer, int32_t eos_id);
std::unique_ptr<GenerationJob> make_openai_job(OpenAiRequest request, OpenAiContext ctx);

}  // namespace kestrel::server
