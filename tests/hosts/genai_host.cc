// onnxruntime-genai's C API generating on NpuEP from a C++ program (no Python of its own).
//
//   genai_host LIB MODEL_FOLDER NEW_TOKENS PROFILE_PREFIX TOKEN...   prints "tokens t1 t2 ..." (the generated ones)
//
// ORT profiles the decoder's session into PROFILE_PREFIX*.json (genai's session option enable_profiling): the
// record of which EP ran each node, since genai reports no graph assignment.
//
// The onnxruntime-genai wheel ships libonnxruntime-genai.so but not its header (ort_genai_c.h), so the functions
// used here are declared from the upstream header's signatures (onnxruntime-genai's src/ort_genai_c.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
typedef struct OgaResult OgaResult;
typedef struct OgaConfig OgaConfig;
typedef struct OgaModel OgaModel;
typedef struct OgaGeneratorParams OgaGeneratorParams;
typedef struct OgaGenerator OgaGenerator;
const char* OgaResultGetError(const OgaResult* result);
void OgaDestroyResult(OgaResult* result);
void OgaRegisterExecutionProviderLibrary(const char* registration_name, const char* library_path);
OgaResult* OgaCreateConfig(const char* config_path, OgaConfig** out);
OgaResult* OgaConfigClearProviders(OgaConfig* config);
OgaResult* OgaConfigAppendProvider(OgaConfig* config, const char* provider);
OgaResult* OgaConfigSetProviderOption(OgaConfig* config, const char* provider, const char* key, const char* value);
OgaResult* OgaConfigOverlay(OgaConfig* config, const char* json);
OgaResult* OgaCreateModelFromConfig(const OgaConfig* config, OgaModel** out);
void OgaDestroyConfig(OgaConfig* config);
void OgaDestroyModel(OgaModel* model);
OgaResult* OgaCreateGeneratorParams(const OgaModel* model, OgaGeneratorParams** out);
void OgaDestroyGeneratorParams(OgaGeneratorParams* params);
OgaResult* OgaGeneratorParamsSetSearchNumber(OgaGeneratorParams* params, const char* name, double value);
OgaResult* OgaGeneratorParamsSetSearchBool(OgaGeneratorParams* params, const char* name, bool value);
OgaResult* OgaCreateGenerator(const OgaModel* model, const OgaGeneratorParams* params, OgaGenerator** out);
void OgaDestroyGenerator(OgaGenerator* generator);
bool OgaGenerator_IsDone(const OgaGenerator* generator);
OgaResult* OgaGenerator_AppendTokens(OgaGenerator* generator, const int32_t* input_ids, size_t count);
OgaResult* OgaGenerator_GenerateNextToken(OgaGenerator* generator);
size_t OgaGenerator_GetSequenceCount(const OgaGenerator* generator, size_t index);
const int32_t* OgaGenerator_GetSequenceData(const OgaGenerator* generator, size_t index);
}

namespace {

void Check(OgaResult* result, const char* what) {
  if (!result) return;
  std::fprintf(stderr, "error: %s: %s\n", what, OgaResultGetError(result));
  OgaDestroyResult(result);
  std::exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s LIB MODEL_FOLDER NEW_TOKENS PROFILE_PREFIX TOKEN...\n", argv[0]);
    return 1;
  }
  const int new_tokens = std::atoi(argv[3]);
  std::vector<int32_t> prompt;
  for (int i = 5; i < argc; ++i) prompt.push_back(std::atoi(argv[i]));

  OgaRegisterExecutionProviderLibrary("NpuEP", argv[1]);
  OgaConfig* config = nullptr;
  Check(OgaCreateConfig(argv[2], &config), "OgaCreateConfig");
  Check(OgaConfigClearProviders(config), "OgaConfigClearProviders");
  Check(OgaConfigAppendProvider(config, "NpuEP"), "OgaConfigAppendProvider");
  Check(OgaConfigSetProviderOption(config, "NpuEP", "cache_dir", ""), "OgaConfigSetProviderOption");
  const std::string overlay =
      std::string(R"({"model": {"decoder": {"session_options": {"enable_profiling": ")") + argv[4] + "\"}}}}";
  Check(OgaConfigOverlay(config, overlay.c_str()), "OgaConfigOverlay");
  OgaModel* model = nullptr;
  Check(OgaCreateModelFromConfig(config, &model), "OgaCreateModelFromConfig");
  OgaGeneratorParams* params = nullptr;
  Check(OgaCreateGeneratorParams(model, &params), "OgaCreateGeneratorParams");
  const double length = static_cast<double>(prompt.size() + new_tokens);
  Check(OgaGeneratorParamsSetSearchNumber(params, "max_length", length), "max_length");
  Check(OgaGeneratorParamsSetSearchNumber(params, "min_length", length), "min_length");  // the whole length
  Check(OgaGeneratorParamsSetSearchBool(params, "do_sample", false), "do_sample");
  OgaGenerator* generator = nullptr;
  Check(OgaCreateGenerator(model, params, &generator), "OgaCreateGenerator");
  Check(OgaGenerator_AppendTokens(generator, prompt.data(), prompt.size()), "OgaGenerator_AppendTokens");
  while (!OgaGenerator_IsDone(generator)) Check(OgaGenerator_GenerateNextToken(generator), "GenerateNextToken");
  const size_t count = OgaGenerator_GetSequenceCount(generator, 0);
  const int32_t* tokens = OgaGenerator_GetSequenceData(generator, 0);
  std::printf("tokens");
  for (size_t i = prompt.size(); i < count; ++i) std::printf(" %d", tokens[i]);
  std::printf("\n");
  std::fflush(stdout);
  OgaDestroyGenerator(generator);
  OgaDestroyGeneratorParams(params);
  OgaDestroyModel(model);
  OgaDestroyConfig(config);
  return 0;
}
