// Test-vector harness: runs llama.cpp's own samplers (libllama, src/llama-sampler.cpp) on cases read
// from stdin and prints, per case, the candidates left in the array (ids and logits, in array order).
// Built against ggml-org/llama.cpp d1b67c94 (2026-05-30); see make_llamacpp_vectors.py for the build.
//
// Input, one directive per line:  CASE name | LOGITS v... | HISTORY t... | BREAKER t... |
// STAGE top_k k | top_p p | min_p p | typical p | top_n_sigma n | xtc prob thr | temp t |
// penalties last_n rep freq pres | dry mult base allowed last_n  | END
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

struct llama_sampler * llama_sampler_init_dry_testing(int32_t context_size, float dry_multiplier, float dry_base,
        int32_t dry_allowed_length, int32_t dry_penalty_last_n, const std::vector<std::vector<llama_token>> & seq_breakers);

static float parse_float(const std::string & s) {
    if (s == "-inf") return -INFINITY;
    return std::stof(s);
}

int main() {
    std::string line, name;
    std::vector<llama_token_data> cur;
    std::vector<llama_token> history;
    std::vector<std::vector<llama_token>> breakers;
    llama_token_data_array cur_p{};
    bool first_out = true;
    printf("[\n");
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if (cmd == "CASE") {
            in >> name;
            cur.clear(); history.clear(); breakers.clear();
        } else if (cmd == "LOGITS") {
            std::string v;
            for (llama_token id = 0; in >> v; ++id) cur.push_back({id, parse_float(v), 0.0f});
            cur_p = {cur.data(), cur.size(), -1, false};
        } else if (cmd == "HISTORY") {
            llama_token t;
            while (in >> t) history.push_back(t);
        } else if (cmd == "BREAKER") {
            std::vector<llama_token> b;
            llama_token t;
            while (in >> t) b.push_back(t);
            breakers.push_back(b);
        } else if (cmd == "STAGE") {
            std::string s;
            in >> s;
            llama_sampler * smpl = nullptr;
            if (s == "top_k") { int k; in >> k; smpl = llama_sampler_init_top_k(k); }
            else if (s == "top_p") { float p; in >> p; smpl = llama_sampler_init_top_p(p, 0); }
            else if (s == "min_p") { float p; in >> p; smpl = llama_sampler_init_min_p(p, 0); }
            else if (s == "typical") { float p; in >> p; smpl = llama_sampler_init_typical(p, 0); }
            else if (s == "top_n_sigma") { float n; in >> n; smpl = llama_sampler_init_top_n_sigma(n); }
            else if (s == "xtc") { float p, t; in >> p >> t; smpl = llama_sampler_init_xtc(p, t, 0, 0); }
            else if (s == "temp") { float t; in >> t; smpl = llama_sampler_init_temp(t); }
            else if (s == "penalties") {
                int n; float r, f, pr; in >> n >> r >> f >> pr;
                smpl = llama_sampler_init_penalties(n, r, f, pr);
            } else if (s == "dry") {
                float m, b; int a, n; in >> m >> b >> a >> n;
                smpl = llama_sampler_init_dry_testing(1 << 20, m, b, a, n, breakers);
            }
            if (!smpl) { fprintf(stderr, "unknown stage %s\n", s.c_str()); return 1; }
            for (llama_token t : history) llama_sampler_accept(smpl, t);
            llama_sampler_apply(smpl, &cur_p);
            llama_sampler_free(smpl);
        } else if (cmd == "END") {
            printf("%s{\"name\": \"%s\", \"ids\": [", first_out ? "" : ",\n", name.c_str());
            for (size_t i = 0; i < cur_p.size; ++i) printf("%s%d", i ? ", " : "", cur_p.data[i].id);
            printf("], \"logits\": [");
            for (size_t i = 0; i < cur_p.size; ++i) {
                const float l = cur_p.data[i].logit;
                if (std::isinf(l)) printf("%s\"%s\"", i ? ", " : "", l > 0 ? "inf" : "-inf");
                else printf("%s%.9g", i ? ", " : "", l);
            }
            printf("]}");
            first_out = false;
        }
    }
    printf("\n]\n");
    return 0;
}
