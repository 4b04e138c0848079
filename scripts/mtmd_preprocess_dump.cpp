// Dump llama.cpp's own image preprocessing, for tests/test_vision_preprocess.py's fixtures.
//
// Loads an mmproj with clip_init, decodes an image file the way llama-server does
// (mtmd_helper_bitmap_init_from_buf: stb_image, 3 channels), runs the preprocessor mtmd.cpp's
// init_vision picks for the projector, and writes a little-endian binary file:
//   "MTPD" int32 version=1
//   int32 nx, ny, then nx*ny*3 uint8         the decoded image
//   int32 grid_x, grid_y, has_overview, n_entries
//   [overview if has_overview] then each entry: int32 nx, ny, then nx*ny*3 float32
//
// Build (against a llama.cpp build tree; LLAMA = the llama.cpp source root):
//   g++ -std=c++17 -O1 scripts/mtmd_preprocess_dump.cpp -I$LLAMA/tools/mtmd -I$LLAMA/include \
//       -I$LLAMA/ggml/include -L$LLAMA/build/bin -lmtmd -lllama -lggml -lggml-base \
//       -Wl,-rpath,$LLAMA/build/bin -o /tmp/mtmd_preprocess_dump
// Run: mtmd_preprocess_dump MMPROJ IMAGE OUT [image_min_tokens image_max_tokens]
// Only the projectors ggstation encodes are handled (gemma3, idefics3, mlp).

#include "clip.h"
#include "clip-impl.h"
#include "mtmd-helper.h"
#include "mtmd-image.h"
#include "mtmd.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

static void put_i32(FILE * f, int32_t v) { fwrite(&v, 4, 1, f); }

static void put_f32_image(FILE * f, const clip_image_f32 & img) {
    put_i32(f, img.nx());
    put_i32(f, img.ny());
    const auto & buf = img.get_ro_buf();
    fwrite(buf.data(), sizeof(float), buf.size(), f);
}

int main(int argc, char ** argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s MMPROJ IMAGE OUT [image_min_tokens image_max_tokens]\n", argv[0]);
        return 2;
    }
    clip_context_params cparams{};
    cparams.use_gpu = false;
    cparams.device = nullptr;
    cparams.flash_attn_type = CLIP_FLASH_ATTN_TYPE_DISABLED;
    cparams.image_min_tokens = argc == 6 ? atoi(argv[4]) : -1;
    cparams.image_max_tokens = argc == 6 ? atoi(argv[5]) : -1;
    cparams.warmup = false;
    cparams.no_alloc = false;
    clip_ctx * ctx_v = clip_init(argv[1], cparams).ctx_v;
    if (!ctx_v) {
        fprintf(stderr, "clip_init failed\n");
        return 1;
    }

    std::ifstream in(argv[2], std::ios::binary);
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto wrapped = mtmd_helper_bitmap_init_from_buf(nullptr, bytes.data(), bytes.size(), false, mtmd_helper_init_opt_default());
    if (!wrapped.bitmap) {
        fprintf(stderr, "failed to load image\n");
        return 1;
    }
    const int nx = (int) mtmd_bitmap_get_nx(wrapped.bitmap);
    const int ny = (int) mtmd_bitmap_get_ny(wrapped.bitmap);
    clip_image_u8 img;
    img.set_size({nx, ny}, false);
    std::vector<uint8_t> px(mtmd_bitmap_get_data(wrapped.bitmap),
                            mtmd_bitmap_get_data(wrapped.bitmap) + mtmd_bitmap_get_n_bytes(wrapped.bitmap));
    img.cpy_buf(px);

    // as mtmd.cpp's init_vision chooses
    std::unique_ptr<mtmd_image_preprocessor> pre;
    switch (clip_get_projector_type(ctx_v)) {
        case PROJECTOR_TYPE_GEMMA3:
            pre = std::make_unique<mtmd_image_preprocessor_fixed_size>(ctx_v);
            break;
        case PROJECTOR_TYPE_IDEFICS3:
            pre = std::make_unique<mtmd_image_preprocessor_idefics3>(ctx_v);
            break;
        case PROJECTOR_TYPE_MLP:
            if (!clip_get_hparams(ctx_v)->image_res_candidates.empty()) {
                pre = std::make_unique<mtmd_image_preprocessor_llava_uhd>(ctx_v);
            } else {
                pre = std::make_unique<mtmd_image_preprocessor_fixed_size>(ctx_v);
            }
            break;
        default:
            fprintf(stderr, "projector not handled by this dump\n");
            return 1;
    }
    mtmd_image_preproc_out out = pre->preprocess(img);

    FILE * f = fopen(argv[3], "wb");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    fwrite("MTPD", 1, 4, f);
    put_i32(f, 1);
    put_i32(f, nx);
    put_i32(f, ny);
    fwrite(px.data(), 1, px.size(), f);
    put_i32(f, out.grid_x);
    put_i32(f, out.grid_y);
    put_i32(f, out.has_overview() ? 1 : 0);
    put_i32(f, (int32_t) out.entries.size());
    if (out.has_overview()) {
        put_f32_image(f, out.overview);
    }
    for (const auto & e : out.entries) {
        put_f32_image(f, e);
    }
    fclose(f);
    mtmd_bitmap_free(wrapped.bitmap);
    clip_free(ctx_v);
    return 0;
}
