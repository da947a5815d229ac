// Engine bindings (sessions are in bind_session.cpp). Long native calls release the GIL;
// NumPy arrays in and out. Every call that takes the engine's lock releases the GIL first:
// a running forward holds that lock and takes the GIL between layers to look at Python's
// signals (bind_session.cpp), so holding the GIL while waiting for the lock would deadlock.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <string_view>
#include <memory>
#include <optional>
#include <tuple>

#include "bindings/attention_args.hpp"
#include "common/errors.hpp"
#include "model/act_kernels.hpp"
#include "model/engine.hpp"
#include "model/ops.hpp"

namespace py = pybind11;

namespace colibri::bindings {

IoFault parse_io_fault(const std::string& s);  // bind_io.cpp
py::dict trace_dict(const std::vector<ReadTraceRecord>& t);  // bind_io.cpp

namespace {

// Any type of the core's dtype table (quant/dtype.cpp); one without kernels fails when
// the engine builds its matmuls, naming the supported types.
DType dtype_from_name(const std::string& name) {
  try {
    return colibri::dtype_from_name(name);
  } catch (const Error&) {
    fail(ErrorKind::Unsupported, "unknown tensor type '" + name + "' (supported: " + implemented_type_names() + ")");
  }
}

// Engine::gpu_report as Model.stats().gpu's raw record (colibri.engine.gpu_offload).
py::object gpu_report_dict(const Engine& e) {
  std::unique_ptr<GpuReport> r;
  {
    py::gil_scoped_release release;
    r = e.gpu_report();
  }
  if (!r) return py::none();
  py::dict d;
  d["adapter"] = r->adapter.name;
  d["backend"] = r->adapter.backend;
  d["adapter_type"] = r->adapter.adapter_type;
  d["weight_bytes"] = r->weight_bytes;
  d["products"] = r->counters.products;
  d["columns"] = r->counters.columns;
  d["dispatches"] = r->counters.dispatches;
  d["bytes_uploaded"] = r->counters.bytes_uploaded;
  d["bytes_read_back"] = r->counters.bytes_read_back;
  d["seconds"] = r->counters.seconds;
  py::list placements;
  for (const GpuPlacement& p : r->placements)
    placements.append(py::make_tuple(p.name, dtype_name(p.type), p.rows, p.cols, p.bytes, p.on_gpu, p.reason));
  d["matrices"] = placements;
  return d;
}

// A copy of gate (the kernels work in place), after checking the two vectors agree.
py::array_t<float> activation_input(const py::array_t<float, py::array::c_style | py::array::forcecast>& gate,
                                    const py::array_t<float, py::array::c_style | py::array::forcecast>& up,
                                    const char* what) {
  if (gate.ndim() != 1 || up.ndim() != 1 || gate.shape(0) != up.shape(0))
    fail(ErrorKind::InvalidArgument, std::string(what) + ": gate and up must be vectors of one length");
  py::array_t<float> out(gate.shape(0));
  std::copy(gate.data(), gate.data() + gate.shape(0), out.mutable_data());
  return out;
}

// None: the kernels the FFN blocks run; else exactly that ISA's.
const ActKernels& activation_kernels(const std::optional<std::string>& isa) {
  if (!isa) return best_act_kernels();
  const std::optional<Isa> which = attention_args::parse_isa(isa);
  const ActKernels* k = which ? act_kernels_for(*which) : nullptr;
  if (!k) fail(ErrorKind::InvalidArgument, "no clamped-SwiGLU kernels for ISA '" + *isa + "' on this CPU");
  return *k;
}

}  // namespace

void bind_engine(py::module_& m) {
  py::enum_<ActPrecision>(m, "ActPrecision")
      .value("int8", ActPrecision::Int8)
      .value("float32", ActPrecision::Float32);

  py::enum_<QkNorm>(m, "QkNorm")
      .value("none", QkNorm::None)
      .value("head", QkNorm::PerHead)
      .value("full", QkNorm::Full);

  py::enum_<AttentionKind>(m, "AttentionKind")
      .value("gqa", AttentionKind::Gqa)
      .value("mla", AttentionKind::Mla)
      .value("v4_sliding", AttentionKind::V4Sliding);

  py::enum_<RouterKind>(m, "RouterKind")
      .value("softmax_topk", RouterKind::SoftmaxTopK)
      .value("sigmoid_grouped", RouterKind::SigmoidGroupedTopK)
      .value("softmax_group_limited", RouterKind::SoftmaxGroupLimited)
      .value("sqrt_softplus", RouterKind::SqrtSoftplusTopK);

  m.def(
      "route",
      [](RouterKind kind, py::array_t<float, py::array::c_style | py::array::forcecast> logits, int64_t top_k,
         bool norm_topk_prob, float scaling, int64_t n_group, int64_t topk_group,
         std::optional<py::array_t<float, py::array::c_style | py::array::forcecast>> bias) {
        if (logits.ndim() != 2) fail(ErrorKind::InvalidArgument, "route: logits must be [tokens, experts]");
        RouterSpec rs;
        rs.kind = kind;
        rs.n_experts = logits.shape(1);
        rs.top_k = top_k;
        rs.norm_topk_prob = norm_topk_prob;
        rs.scaling = scaling;
        rs.n_group = n_group;
        rs.topk_group = topk_group;
        const auto router = make_router(rs);
        if (bias && (bias->ndim() != 1 || bias->shape(0) != rs.n_experts))
          fail(ErrorKind::InvalidArgument, "route: bias must have one value per expert");
        const int64_t n = logits.shape(0);
        py::array_t<int32_t> experts({n, top_k});
        py::array_t<float> weights({n, top_k});
        std::vector<float> row(static_cast<std::size_t>(rs.n_experts));
        for (int64_t t = 0; t < n; ++t) {
          std::copy(logits.data() + t * rs.n_experts, logits.data() + (t + 1) * rs.n_experts, row.begin());
          router->route(row.data(), bias ? bias->data() : nullptr, experts.mutable_data() + t * top_k,
                        weights.mutable_data() + t * top_k);
        }
        return py::make_tuple(experts, weights);
      },
      py::arg("kind"), py::arg("logits"), py::arg("top_k"), py::arg("norm_topk_prob") = false,
      py::arg("scaling") = 1.0f, py::arg("n_group") = 1, py::arg("topk_group") = 1, py::arg("bias") = py::none(),
      "One routing rule (csrc/model/routers/) on router logits [tokens, experts]: (experts, weights),"
      " each [tokens, top_k], best first. The MoE layers and the lookahead prefetch run the same code.");

  py::enum_<FfnActivation>(m, "FfnActivation")
      .value("silu", FfnActivation::Silu)
      .value("swiglu_oai", FfnActivation::SwigluOai)
      .value("swiglu_clamp", FfnActivation::SwigluClamp);

  m.def(
      "swiglu_oai",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> gate,
         py::array_t<float, py::array::c_style | py::array::forcecast> up, float limit, float alpha,
         const std::optional<std::string>& isa) {
        py::array_t<float> out = activation_input(gate, up, "swiglu_oai");
        const ActKernels& k = activation_kernels(isa);
        k.swiglu_oai(out.mutable_data(), up.data(), gate.shape(0), limit, alpha);
        return out;
      },
      py::arg("gate"), py::arg("up"), py::arg("limit"), py::arg("alpha"), py::arg("isa") = py::none(),
      "gpt-oss's clamped SwiGLU over two vectors, as the FFN blocks run it. isa: None (the "
      "best, as the FFN blocks), or scalar / avx2 / avx512 (ValueError where not available).");

  m.def(
      "swiglu_clamp",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> gate,
         py::array_t<float, py::array::c_style | py::array::forcecast> up, float limit,
         const std::optional<std::string>& isa) {
        py::array_t<float> out = activation_input(gate, up, "swiglu_clamp");
        const ActKernels& k = activation_kernels(isa);
        k.swiglu_clamp(out.mutable_data(), up.data(), gate.shape(0), limit);
        return out;
      },
      py::arg("gate"), py::arg("up"), py::arg("limit"), py::arg("isa") = py::none(),
      "DeepSeek-V4's clamped SwiGLU over two vectors, as the FFN blocks run it; isa as for "
      "swiglu_oai.");

  py::class_<Extent>(m, "Extent")
      .def(py::init([](int32_t file, uint64_t offset, uint64_t length) { return Extent{file, offset, length}; }),
           py::arg("file"), py::arg("offset"), py::arg("length"))
      .def_readwrite("file", &Extent::file)
      .def_readwrite("offset", &Extent::offset)
      .def_readwrite("length", &Extent::length);

  py::class_<TensorSpec>(m, "TensorSpec")
      .def(py::init([](std::string name, const std::string& dtype, std::vector<int64_t> shape,
                       std::vector<Extent> extents, int64_t unpermute, std::optional<uint32_t> crc32,
                       std::vector<Extent> scale_extents, std::vector<int64_t> scale_block, int64_t transpose,
                       py::array_t<float, py::array::c_style | py::array::forcecast> scale_values) {
             TensorSpec t;
             t.name = std::move(name);
             t.type = dtype_from_name(dtype);
             t.shape = std::move(shape);
             t.extents = std::move(extents);
             t.rope_unpermute_heads = unpermute;
             t.has_crc32 = crc32.has_value();
             t.crc32 = crc32.value_or(0);
             t.scale_extents = std::move(scale_extents);
             if (!scale_block.empty()) {
               if (scale_block.size() != 2) fail(ErrorKind::InvalidArgument, "scale_block must be (rows, cols)");
               t.scale_block_rows = scale_block[0];
               t.scale_block_cols = scale_block[1];
             }
             t.transpose_heads = transpose;
             if (scale_values.size() > 0)
               t.scale_values.assign(scale_values.data(), scale_values.data() + scale_values.size());
             return t;
           }),
           py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("extents"),
           py::arg("rope_unpermute_heads") = 0, py::arg("crc32") = py::none(),
           py::arg("scale_extents") = std::vector<Extent>{}, py::arg("scale_block") = std::vector<int64_t>{},
           py::arg("transpose_heads") = 0,
           py::arg("scale_values") = py::array_t<float>(0))
      .def_readonly("name", &TensorSpec::name)
      .def_readonly("shape", &TensorSpec::shape);

  py::class_<ModelSpec>(m, "ModelSpec")
      .def(py::init<>())
      .def_readwrite("arch", &ModelSpec::arch)
      .def_readwrite("vocab_size", &ModelSpec::vocab_size)
      .def_readwrite("hidden_size", &ModelSpec::hidden_size)
      .def_readwrite("n_layers", &ModelSpec::n_layers)
      .def_readwrite("n_heads", &ModelSpec::n_heads)
      .def_readwrite("n_kv_heads", &ModelSpec::n_kv_heads)
      .def_readwrite("head_dim", &ModelSpec::head_dim)
      .def_readwrite("intermediate_size", &ModelSpec::intermediate_size)
      .def_readwrite("rms_norm_eps", &ModelSpec::rms_norm_eps)
      .def_readwrite("rope_inv_freq", &ModelSpec::rope_inv_freq)
      .def_readwrite("rope_attention_factor", &ModelSpec::rope_attention_factor)
      .def_readwrite("attention_scale", &ModelSpec::attention_scale)
      .def_readwrite("qk_norm", &ModelSpec::qk_norm)
      .def_readwrite("attention_bias", &ModelSpec::attention_bias)
      .def_readwrite("attention_sinks", &ModelSpec::attention_sinks)
      .def_readwrite("sliding_window", &ModelSpec::sliding_window)
      .def_readwrite("sliding_layers", &ModelSpec::sliding_layers)
      .def_readwrite("attention_out_bias", &ModelSpec::attention_out_bias)
      .def_readwrite("n_experts", &ModelSpec::n_experts)
      .def_readwrite("n_experts_per_tok", &ModelSpec::n_experts_per_tok)
      .def_readwrite("moe_intermediate_size", &ModelSpec::moe_intermediate_size)
      .def_readwrite("norm_topk_prob", &ModelSpec::norm_topk_prob)
      .def_readwrite("router", &ModelSpec::router)
      .def_readwrite("routed_scaling_factor", &ModelSpec::routed_scaling_factor)
      .def_readwrite("n_group", &ModelSpec::n_group)
      .def_readwrite("topk_group", &ModelSpec::topk_group)
      .def_readwrite("shared_expert_intermediate_size", &ModelSpec::shared_expert_intermediate_size)
      .def_readwrite("moe_layers", &ModelSpec::moe_layers)
      .def_readwrite("router_logit_bias", &ModelSpec::router_logit_bias)
      .def_readwrite("expert_bias", &ModelSpec::expert_bias)
      .def_readwrite("activation", &ModelSpec::activation)
      .def_readwrite("swiglu_limit", &ModelSpec::swiglu_limit)
      .def_readwrite("swiglu_alpha", &ModelSpec::swiglu_alpha)
      .def_readwrite("tie_word_embeddings", &ModelSpec::tie_word_embeddings)
      .def_readwrite("context_length", &ModelSpec::context_length)
      .def_readwrite("rope_interleaved", &ModelSpec::rope_interleaved)
      .def_readwrite("attention_kind", &ModelSpec::attention_kind)
      .def_readwrite("q_lora_rank", &ModelSpec::q_lora_rank)
      .def_readwrite("kv_lora_rank", &ModelSpec::kv_lora_rank)
      .def_readwrite("qk_nope_head_dim", &ModelSpec::qk_nope_head_dim)
      .def_readwrite("qk_rope_head_dim", &ModelSpec::qk_rope_head_dim)
      .def_readwrite("v_head_dim", &ModelSpec::v_head_dim)
      .def_readwrite("mla_norm_eps", &ModelSpec::mla_norm_eps)
      .def_readwrite("index_n_heads", &ModelSpec::index_n_heads)
      .def_readwrite("index_head_dim", &ModelSpec::index_head_dim)
      .def_readwrite("index_topk", &ModelSpec::index_topk)
      .def_readwrite("indexer_full", &ModelSpec::indexer_full)
      .def_readwrite("index_rope_interleaved", &ModelSpec::index_rope_interleaved)
      .def_readwrite("n_mtp_layers", &ModelSpec::n_mtp_layers)
      .def_readwrite("o_groups", &ModelSpec::o_groups)
      .def_readwrite("o_lora_rank", &ModelSpec::o_lora_rank)
      .def_readwrite("hc_mult", &ModelSpec::hc_mult)
      .def_readwrite("hc_sinkhorn_iters", &ModelSpec::hc_sinkhorn_iters)
      .def_readwrite("hc_eps", &ModelSpec::hc_eps)
      .def_readwrite("hash_layers", &ModelSpec::hash_layers)
      .def_readwrite("compress_ratios", &ModelSpec::compress_ratios)
      .def_readwrite("csa_layers", &ModelSpec::csa_layers)
      .def_readwrite("compress_rope_inv_freq", &ModelSpec::compress_rope_inv_freq)
      .def_readwrite("compress_rope_attention_factor", &ModelSpec::compress_rope_attention_factor)
      .def_readwrite("linear_layers", &ModelSpec::linear_layers)
      .def_readwrite("linear_num_key_heads", &ModelSpec::linear_num_key_heads)
      .def_readwrite("linear_num_value_heads", &ModelSpec::linear_num_value_heads)
      .def_readwrite("linear_key_head_dim", &ModelSpec::linear_key_head_dim)
      .def_readwrite("linear_value_head_dim", &ModelSpec::linear_value_head_dim)
      .def_readwrite("linear_conv_kernel", &ModelSpec::linear_conv_kernel)
      .def_readwrite("linear_chunked_min_tokens", &ModelSpec::linear_chunked_min_tokens)
      .def_readwrite("linear_a_neg_exp", &ModelSpec::linear_a_neg_exp)
      .def_readwrite("linear_v_tiled", &ModelSpec::linear_v_tiled)
      .def_readwrite("linear_kda", &ModelSpec::linear_kda)
      .def_readwrite("mla_no_rope", &ModelSpec::mla_no_rope)
      .def_readwrite("attention_output_gate", &ModelSpec::attention_output_gate)
      .def_readwrite("norm_weight_offset", &ModelSpec::norm_weight_offset)
      .def_readwrite("sliding_n_kv_heads", &ModelSpec::sliding_n_kv_heads)
      .def_readwrite("sliding_rope_inv_freq", &ModelSpec::sliding_rope_inv_freq)
      .def_readwrite("sinks_sliding_only", &ModelSpec::sinks_sliding_only)
      .def_readwrite("attention_value_scale", &ModelSpec::attention_value_scale);

  py::enum_<CachePolicy>(m, "CachePolicy")
      .value("lru", CachePolicy::Lru)
      .value("lfru", CachePolicy::Lfru)
      .value("pinned", CachePolicy::Pinned);

  py::enum_<ChecksumMode>(m, "ChecksumMode")
      .value("off", ChecksumMode::Off)
      .value("first", ChecksumMode::First)
      .value("always", ChecksumMode::Always);

  py::class_<ExpertBlob>(m, "ExpertBlob")
      .def(py::init([](int64_t layer, int64_t expert, Extent extent, std::optional<uint32_t> crc32) {
             return ExpertBlob{layer, expert, extent, crc32.has_value(), crc32.value_or(0)};
           }),
           py::arg("layer"), py::arg("expert"), py::arg("extent"), py::arg("crc32") = py::none())
      .def_readonly("layer", &ExpertBlob::layer)
      .def_readonly("expert", &ExpertBlob::expert);

  py::class_<StoreSettings>(m, "StoreSettings")
      .def(py::init<>())
      .def_readwrite("cache_bytes", &StoreSettings::cache_bytes)
      .def_readwrite("workers", &StoreSettings::workers)
      .def_readwrite("max_in_flight", &StoreSettings::max_in_flight)
      .def_readwrite("direct", &StoreSettings::direct)
      .def_readwrite("prefetch", &StoreSettings::prefetch)
      .def_readwrite("first_layer_guess", &StoreSettings::first_layer_guess)
      .def_readwrite("prefetch_min_accuracy", &StoreSettings::prefetch_min_accuracy)
      .def_readwrite("policy", &StoreSettings::policy)
      .def_readwrite("pin_fraction", &StoreSettings::pin_fraction)
      .def_readwrite("checksums", &StoreSettings::checksums);

  py::class_<ExpertStoreStats>(m, "ExpertStoreStats")
      .def_readonly("hits", &ExpertStoreStats::hits)
      .def_readonly("misses", &ExpertStoreStats::misses)
      .def_readonly("ready_hits", &ExpertStoreStats::ready_hits)
      .def_readonly("reads", &ExpertStoreStats::reads)
      .def_readonly("bytes_read", &ExpertStoreStats::bytes_read)
      .def_readonly("read_errors", &ExpertStoreStats::read_errors)
      .def_readonly("checksum_failures", &ExpertStoreStats::checksum_failures)
      .def_readonly("read_seconds", &ExpertStoreStats::read_seconds)
      .def_readonly("stall_seconds", &ExpertStoreStats::stall_seconds)
      .def_readonly("prefetch_issued", &ExpertStoreStats::prefetch_issued)
      .def_readonly("prefetch_used", &ExpertStoreStats::prefetch_used)
      .def_readonly("prefetch_wasted", &ExpertStoreStats::prefetch_wasted)
      .def_readonly("prefetch_cancelled", &ExpertStoreStats::prefetch_cancelled)
      .def_readonly("prefetch_candidates", &ExpertStoreStats::prefetch_candidates)
      .def_readonly("prefetch_candidates_used", &ExpertStoreStats::prefetch_candidates_used)
      .def_readonly("prefetch_throttled", &ExpertStoreStats::prefetch_throttled)
      .def_readonly("prefetch_suppressed", &ExpertStoreStats::prefetch_suppressed)
      .def_readonly("prefetch_switched_off", &ExpertStoreStats::prefetch_switched_off)
      .def_readonly("prefetch_switched_on", &ExpertStoreStats::prefetch_switched_on)
      .def_readonly("first_candidates", &ExpertStoreStats::first_candidates)
      .def_readonly("first_candidates_used", &ExpertStoreStats::first_candidates_used)
      .def_readonly("first_issued", &ExpertStoreStats::first_issued)
      .def_readonly("first_used", &ExpertStoreStats::first_used)
      .def_readonly("first_wasted", &ExpertStoreStats::first_wasted)
      .def_readonly("predicted_routed", &ExpertStoreStats::predicted_routed)
      .def_readonly("routed_after_prediction", &ExpertStoreStats::routed_after_prediction)
      .def_readonly("evictions", &ExpertStoreStats::evictions)
      .def_readonly("direct_reads", &ExpertStoreStats::direct_reads)
      .def_readonly("buffered_reads", &ExpertStoreStats::buffered_reads)
      .def_readonly("inline_reads", &ExpertStoreStats::inline_reads)
      .def_readonly("cap_waits", &ExpertStoreStats::cap_waits)
      .def_readonly("busy_seconds", &ExpertStoreStats::busy_seconds)
      .def_readonly("io_and_compute_seconds", &ExpertStoreStats::io_and_compute_seconds)
      .def_readonly("io_only_seconds", &ExpertStoreStats::io_only_seconds)
      .def_readonly("compute_only_seconds", &ExpertStoreStats::compute_only_seconds)
      .def_readonly("neither_seconds", &ExpertStoreStats::neither_seconds);

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init([](ModelSpec spec, const std::vector<TensorSpec>& tensors,
                       const std::vector<std::string>& files, const ThreadSettings& threads,
                       const std::vector<ExpertBlob>& blobs) {
             py::gil_scoped_release release;
             return std::make_shared<Engine>(std::move(spec), tensors, files, threads, blobs);
           }),
           py::arg("spec"), py::arg("tensors"), py::arg("files"), py::arg("threads"),
           py::arg("blobs") = std::vector<ExpertBlob>{})
      .def("configure_store", &Engine::configure_store, py::arg("settings"),
           py::call_guard<py::gil_scoped_release>())
      .def("preload_experts", &Engine::preload_experts, py::call_guard<py::gil_scoped_release>())
      .def("set_expert_pins", &Engine::set_expert_pins, py::arg("keys"), py::call_guard<py::gil_scoped_release>())
      .def("route_counts",
           [](const Engine& e) {
             std::vector<uint64_t> c;
             {
               py::gil_scoped_release release;
               c = e.route_counts();
             }
             py::array_t<uint64_t> out(static_cast<py::ssize_t>(c.size()));
             std::copy(c.begin(), c.end(), out.mutable_data());
             return out;
           })
      .def("store_stats", &Engine::store_stats, py::call_guard<py::gil_scoped_release>())
      .def("reset_store_stats", &Engine::reset_store_stats, py::call_guard<py::gil_scoped_release>())
      .def("phase_seconds", &Engine::phase_seconds, py::call_guard<py::gil_scoped_release>())
      .def("use_gpu", &Engine::use_gpu, py::arg("library_path"), py::arg("adapter_index"),
           py::arg("memory_budget") = 0, py::call_guard<py::gil_scoped_release>(),
           "Run the linear layers on adapter `adapter_index` of the wgpu-native library at "
           "library_path (docs/gpu.md); memory_budget: bytes of weights at most, 0 = no limit.")
      .def("gpu_report", &gpu_report_dict,
           "None on the CPU; else the adapter, the GPU counters and 'matrices': (name, type, "
           "rows, cols, bytes, on_gpu, reason) for every resident matrix.")
      .def("last_dsa_selection", &Engine::last_dsa_selection, py::call_guard<py::gil_scoped_release>(),
           "Test hook: (keys, offsets) of the last forward's last full DSA indexer layer; query "
           "t attended to keys[offsets[t]:offsets[t + 1]] (positions). Both empty without one.")
      .def("start_io_trace", &Engine::start_io_trace, py::arg("max_records"),
           py::call_guard<py::gil_scoped_release>(),
           "Trace the expert reads that finish from now on (ReadPool.start_trace).")
      .def(
          "io_trace",
          [](const Engine& e) {
            std::vector<ReadTraceRecord> t;
            {
              py::gil_scoped_release release;
              t = e.io_trace();
            }
            return trace_dict(t);
          },
          "The expert reads traced so far (ReadPool.trace's columns).")
      .def(
          "set_io_fault",
          [](Engine& e, const std::string& f) {
            const IoFault fault = parse_io_fault(f);
            py::gil_scoped_release release;
            e.set_io_fault(fault);
          },
          py::arg("fault"))
      .def_property_readonly("auto_wait_policy", &Engine::auto_wait_policy)
      .def_property_readonly("io_workers", [](const Engine& e) { return e.store().io_workers(); },
                             "Expert-read workers in use.")
      .def_property_readonly("io_max_in_flight", [](const Engine& e) { return e.store().io_max_in_flight(); },
                             "Reads on the device at once (the cap; 0: none).")
      .def_property_readonly(
          "io_depth_curve",
          [](const Engine& e) {
            std::vector<std::pair<int, double>> out;
            for (const auto& s : e.store().depth_curve()) out.emplace_back(s.depth, s.gbps);
            return out;
          },
          "workers or max_in_flight auto: (reads in flight, GB/s) measured at configure; empty otherwise.")
      .def_property_readonly("prefetch_active", [](const Engine& e) { return e.store().prefetch_active(); },
                             "Whether the prefetch governor has the lookahead's reads on now.")
      .def_property_readonly("prefetch_accuracy", [](const Engine& e) { return e.store().prefetch_accuracy(); },
                             "Used share of the governor's recent prefetch candidates.")
      .def_property_readonly("first_guess_active", [](const Engine& e) { return e.store().first_guess_active(); },
                             "Whether the first-layer guess's own governor has its reads on now.")
      .def_property_readonly("first_guess_accuracy", [](const Engine& e) { return e.store().first_guess_accuracy(); },
                             "Used share of the first-layer guess's recent candidates.")
      .def_property_readonly("expert_slot_bytes", [](const Engine& e) { return e.store().slot_bytes(); })
      .def_property_readonly("expert_bytes", [](const Engine& e) { return e.store().expert_bytes(); })
      .def_property_readonly("streamed_experts", [](const Engine& e) { return e.store().n_streamed(); })
      .def_property_readonly("cache_slots", [](const Engine& e) { return e.store().slots(); })
      .def_property_readonly("cached_experts", [](const Engine& e) { return e.store().cached(); })
      .def_property_readonly("pinned_experts", [](const Engine& e) { return e.store().pinned(); })
      .def_property_readonly("io_fallbacks", [](const Engine& e) { return e.store().io_fallbacks(); })
      .def("configure_threads", &Engine::configure_threads, py::arg("settings"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("thread_settings", &Engine::thread_settings)
      .def("thread_stats", &Engine::thread_stats)
      .def("reset_thread_stats", &Engine::reset_thread_stats, py::call_guard<py::gil_scoped_release>())
      .def_property("activation_precision", &Engine::activation_precision,
                    [](Engine& e, ActPrecision p) {
                      py::gil_scoped_release release;
                      e.set_activation_precision(p);
                    })
      .def_property_readonly("weight_bytes", &Engine::weight_bytes)
      .def_property_readonly("lane_weight_bytes", &Engine::lane_weight_bytes,
                             "Resident weight bytes in the row-lane layout the AVX-512 kernels read")
      .def_property_readonly(
          "kv_layouts",
          [](const Engine& e) {
            std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> out;
            for (const auto& l : e.kv_layouts()) out.emplace_back(l.k_heads, l.k_dim, l.v_heads, l.v_dim);
            return out;
          },
          "Per layer, what a session's KV cache keeps per position: (k_heads, k_dim, v_heads, v_dim)")
      .def_property_readonly(
          "kv_bytes_per_token", [](const Engine& e) { return kv_bytes_per_position(e.kv_layouts(), DType::F32); },
          "Bytes of one position's KV rows over all layers at F32")
      .def_property_readonly(
          "mtp_kv_bytes_per_token",
          [](const Engine& e) -> std::size_t {
            return e.mtp_layers().empty() ? 0 : kv_bytes_per_position({e.mtp_kv_layout(0)}, DType::F32);
          },
          "Bytes of one position's KV rows in the MTP layer's own cache at F32 (the one layer a "
          "drafting session runs; 0 without MTP layers)")
      .def_property_readonly("mtp_layers", [](const Engine& e) { return static_cast<int64_t>(e.mtp_layers().size()); },
                             "Multi-token-prediction layers loaded (not run by forward)")
      .def_property_readonly("spec", &Engine::spec, py::return_value_policy::copy);
}

}  // namespace colibri::bindings
